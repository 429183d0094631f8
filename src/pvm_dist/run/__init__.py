"""One run of one model: its configuration, the training session that feeds frames and takes metrics,
and the commands built on it (train, evaluate, bench)."""
