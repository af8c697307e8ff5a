"""Demo mode: a ready-to-use ``demo`` tenant with a key, and three demo LoRA adapters trained locally."""
