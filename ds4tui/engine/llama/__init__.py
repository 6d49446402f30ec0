"""The llama family (llama, and SmolLM2 and others of its shape): config, model, session, loading."""
