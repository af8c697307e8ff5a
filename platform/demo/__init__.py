"""Demo mode: a ready-to-use ``demo`` tenant with a key, and two demo LoRA adapters trained locally."""
