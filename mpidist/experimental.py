"""``mpidist.experimental``: the names of ``tf.distribute.experimental``. This module only re-exports."""
from .cross_device import CollectiveCommunication, CollectiveHints, CommunicationImplementation, CommunicationOptions
from .frameworks import CentralStorageStrategy
from .frameworks import ExperimentalMultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy
from .values import ValueContext

__all__ = ["CollectiveCommunication", "CollectiveHints", "CommunicationImplementation", "CommunicationOptions",
           "CentralStorageStrategy", "MultiWorkerMirroredStrategy", "ValueContext"]
