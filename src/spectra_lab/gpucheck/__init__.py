"""The GPU check: ``spectra bench gpu-check`` (``make gpu-check``) runs every CUDA check at once."""
