"""The operator as a process: leader election, start-up checks, metrics, the clock."""
