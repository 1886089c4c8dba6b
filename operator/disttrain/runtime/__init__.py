"""The operator as a process: leader election, start-up checks, metrics, the clock, and the link
between the controller and the progress endpoint's process (progress_link.py), which both import."""
