"""Text: tokenizers and chat templates, shared by the families."""
