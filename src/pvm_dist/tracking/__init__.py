"""MLflow tracking that never stalls or breaks training, and the comparison of tracked runs."""
