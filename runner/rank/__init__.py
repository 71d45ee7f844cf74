"""What runs inside each rank process: the training loop and its engines, memory meters, evaluation,
checkpoint save and load, and the runner of a user's own script."""
