"""The DistTrainJob API: its names, spec, defaults, status and CRD, and the vocabulary every layer
shares (object references, the pod as the operator sees it). Imports nothing else of ours.
"""
