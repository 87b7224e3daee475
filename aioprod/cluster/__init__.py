"""What the producer knows of the cluster, and the one task that keeps it fresh."""
