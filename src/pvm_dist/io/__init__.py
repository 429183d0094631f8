"""Files a run writes: checkpoints (no pickle, checksummed, atomic) and pictures and animations."""
