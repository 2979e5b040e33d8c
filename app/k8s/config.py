"""The ``TAILGUARD_K8S_*`` settings' rules (pure): what :class:`tailguard.settings.Settings` checks for
``tailguard k8s-sync``, kept beside the code that uses them. Reads no environment."""

from __future__ import annotations

import re
from typing import Protocol
from urllib.parse import urlparse

from tailguard.core.contract.config import SettingError
from tailguard.k8s.plan import QUALIFIED_NAME, NodeIdRule


class K8sSettings(Protocol):
    """The settings :func:`check_k8s` reads (:class:`tailguard.settings.Settings` has them; typed
    here so that this module does not import the settings module that calls it)."""

    @property
    def k8s_api_url(self) -> str: ...
    @property
    def k8s_condition(self) -> str: ...
    @property
    def k8s_model_label(self) -> str: ...
    @property
    def k8s_node_id(self) -> str: ...
    @property
    def k8s_namespace(self) -> str: ...
    @property
    def k8s_lease_name(self) -> str: ...
    @property
    def k8s_lease_duration_s(self) -> float: ...
    @property
    def k8s_resync_s(self) -> float: ...
    @property
    def k8s_webhook_listen(self) -> str: ...
    @property
    def k8s_webhook_certfile(self) -> str: ...
    @property
    def k8s_webhook_keyfile(self) -> str: ...


def check_k8s(s: K8sSettings) -> None:
    """Validate the ``TAILGUARD_K8S_*`` settings (called by :class:`tailguard.settings.Settings`)."""
    if s.k8s_api_url and urlparse(s.k8s_api_url).scheme not in ("https", "http"):
        raise SettingError("TAILGUARD_K8S_API_URL", s.k8s_api_url, "the apiserver's https:// URL, or empty "
                           "in the cluster")
    for var, name in (("TAILGUARD_K8S_CONDITION", s.k8s_condition),
                      ("TAILGUARD_K8S_MODEL_LABEL", s.k8s_model_label)):
        if not QUALIFIED_NAME.match(name) or len(name.rpartition("/")[2]) > 63:
            raise SettingError(var, name, "a Kubernetes qualified name: [prefix/]name, e.g. tailguard.io/routable")
    try:
        NodeIdRule.parse(s.k8s_node_id)
    except ValueError:
        raise SettingError("TAILGUARD_K8S_NODE_ID", s.k8s_node_id,
                           "name (the pod's name), label:<label key> or ip:<port> (<pod IP>:<port>)") from None
    if s.k8s_namespace and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", s.k8s_namespace):
        raise SettingError("TAILGUARD_K8S_NAMESPACE", s.k8s_namespace, "a namespace name, or empty")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", s.k8s_lease_name):
        raise SettingError("TAILGUARD_K8S_LEASE_NAME", s.k8s_lease_name, "a Kubernetes object name")
    if not 1.0 <= s.k8s_lease_duration_s <= 3600.0:
        raise SettingError("TAILGUARD_K8S_LEASE_DURATION_S", s.k8s_lease_duration_s, "seconds in [1, 3600]")
    if not 0.1 <= s.k8s_resync_s <= 3600.0:
        raise SettingError("TAILGUARD_K8S_RESYNC_S", s.k8s_resync_s, "seconds in [0.1, 3600]")
    host, sep, port = s.k8s_webhook_listen.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) <= 65535):
        raise SettingError("TAILGUARD_K8S_WEBHOOK_LISTEN", s.k8s_webhook_listen, "HOST:PORT, e.g. 0.0.0.0:8443")
    if bool(s.k8s_webhook_certfile) != bool(s.k8s_webhook_keyfile):
        raise SettingError("TAILGUARD_K8S_WEBHOOK_KEYFILE" if s.k8s_webhook_certfile else
                           "TAILGUARD_K8S_WEBHOOK_CERTFILE", "", "set together with its pair (certificate + key)")
