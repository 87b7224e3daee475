"""aioprod: an asyncio-native Apache Kafka producer."""

from aioprod.errors import KafkaError
from aioprod.producer.batch import TopicPartition
from aioprod.producer.producer import Producer
from aioprod.producer.record_future import RecordFuture, RecordMetadata
from aioprod.producer.transactions import ConsumerGroupMetadata, OffsetAndMetadata, PreparedTransaction
from aioprod.sync import SyncProducer

__all__ = [
    "ConsumerGroupMetadata",
    "KafkaError",
    "OffsetAndMetadata",
    "PreparedTransaction",
    "Producer",
    "RecordFuture",
    "RecordMetadata",
    "SyncProducer",
    "TopicPartition",
]
__version__ = "0.1.0"
