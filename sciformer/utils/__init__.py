"""Small helpers shared across the package."""
