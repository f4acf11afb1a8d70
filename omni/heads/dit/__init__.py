"""The image head: a diffusers transformer pipeline streaming progressive previews."""
