"""Native model families (one file each) and the registry keyed by ``config.architectures[0]``."""
