"""The progress endpoint's process (`python -m disttrain.endpoint`, started and restarted by the
controller's watch/progress_supervisor.py): everything a pod sends lands here and nowhere else.
Its socket and bounds (listener), each request's answer (server), what a request carries (checks),
tokens' signatures (keys), the bookkeeping (limits). It talks to the controller only through
runtime/progress_link.py, and never imports the controller's code (pyproject's contracts).
"""
