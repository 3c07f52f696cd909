"""`ckptbench train CONFIG`: stall in a real training loop (see bench.run.training.loop).

config (bench.config.training, torch-free) -> model (the transformer and its optimizer) -> loop
(every engine in turn on the run core, rows into training_steps.csv and
training_checkpoints.csv).
"""
