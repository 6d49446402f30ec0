"""widgets package."""
