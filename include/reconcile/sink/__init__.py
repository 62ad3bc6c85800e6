"""The stages of a batch: mint -> write -> append, plus compact and check; ``run.run_batch`` runs one batch."""
