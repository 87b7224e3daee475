"""aioprod: an asyncio-native Apache Kafka producer."""

from aioprod.errors import KafkaError
from aioprod.producer.batch import RecordMetadata, TopicPartition
from aioprod.producer.producer import Producer
from aioprod.sync import SyncProducer

__all__ = ["KafkaError", "Producer", "RecordMetadata", "SyncProducer", "TopicPartition"]
__version__ = "0.1.0"
