"""The DeepSeek V4 family: config, network parts, model, session, payload, SWA policies, weights."""
