"""The shared attention core: dense (token sequence) and neighbourhood (point) forms."""
