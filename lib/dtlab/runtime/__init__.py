"""The runtime: a warm pool of rank processes (the Cluster) and torchrun start-up."""
