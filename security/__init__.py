"""Trust: tenant keys, page sealing, erasure receipts, audit log, principals.

Imports neither ``store`` nor ``agentkv_cluster``.
"""
