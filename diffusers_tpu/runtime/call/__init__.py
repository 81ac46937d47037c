"""What runs in a pipeline call: the denoiser's compiled entry, guidance as one batch, the step's glue."""
