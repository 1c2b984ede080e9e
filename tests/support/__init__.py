"""Pytest fixture plugins that start the real components the tests run against.

Each module is a plugin registered from ``tests/conftest.py`` (``pytest_plugins``):

- ``support.tools``: locates the pinned tool binaries (``tools/versions.env``) installed by
  ``scripts/install-tools.sh``; a missing tool is an error naming the fix, never a skip.
- ``support.controlplane``: a real etcd + kube-apiserver (RBAC, token auth, service-account tokens).
- ``support.helm``: helm with isolated home directories.
- ``support.prometheus``: prometheus servers scraping given targets, and promtool.
- ``support.kmockfix``: kmock's Kubernetes emulator for fast operator-logic tests.
"""
