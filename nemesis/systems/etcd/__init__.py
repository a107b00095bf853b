from nemesis.systems.etcd.system import EtcdSystem

__all__ = ["EtcdSystem"]
