"""Built-in models for planning (configurable, buildable on the meta device)."""
