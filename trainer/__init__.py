"""Infrastructure of grpo.py: what runs the method (the vLLM engine, ...), not the method itself."""
