"""The outer updates: outer optimizers, the outer step, overlap, compression, quantized means and sparse
payloads. The pre-training loop uses them; nothing here imports the loop."""
