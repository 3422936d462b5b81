"""Point-cloud models, layers and transforms."""
