"""Head adaptation: run, the teacher cache, the data windows and the training loop."""
