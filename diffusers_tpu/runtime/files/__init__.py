"""What a user keeps on disk: outputs written atomically, staged runs."""
