"""Pure detection core.

Imports no faust, aiokafka or redis, reads no clock and no environment
(enforced by ruff's TID251 and by ``tests/unit/test_core_purity.py``).
Time enters as a ``now_s``/``ts`` argument; settings enter as a
:class:`~app.core.config.DetectorSettings`.
"""
