"""LoRA adapters served over one base model: PEFT checkpoints read and checked (``adapter``), the names
the engine serves (``registry``) and the device slots the model's projections read them from (``slots``)."""
