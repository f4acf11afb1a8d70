"""Speculative decoding: proposers guess tokens, one target step scores them all (see ``proposer``)."""
