"""Object stores, remote log and lake tiering."""
