"""Talking to the API server: our REST client, kopf's login, the writes the controller makes, and what
an error from the API server means.
"""
