"""The streaming package's exceptions.

::

    StreamingError          base of everything tailguard.streaming raises on purpose
    ├── TopicSetupError     a topic could not be created or has the wrong shape
    └── AllowlistError      a configured node-id allowlist source cannot be read

Bad arguments raise the built-in ``ValueError``/``TypeError``. Bad *input
messages* never raise out of the service: they are counted, logged with their
Kafka coordinates and dead-lettered (:mod:`tailguard.streaming.deadletter`).
"""

from __future__ import annotations


class StreamingError(Exception):
    """Base of the streaming package's domain and I/O errors."""


class TopicSetupError(StreamingError):
    """A Kafka topic is missing and could not be created, or is misconfigured."""

    def __init__(self, topic: str, problem: str) -> None:
        self.topic, self.problem = topic, problem
        super().__init__(
            f"Kafka topic {topic!r}: {problem}. Check TAILGUARD_KAFKA_BOOTSTRAP and that the "
            "broker allows topic creation (or create the topic yourself with "
            "TAILGUARD_TOPIC_PARTITIONS partitions)"
        )


class AllowlistError(StreamingError):
    """A configured allowlist source cannot be read; the message names the setting."""
