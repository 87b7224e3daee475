"""The producer: API, partitioner, accumulator, sender (the data path's stages)."""
