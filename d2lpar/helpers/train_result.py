"""TrainResult: what notebook 8's `train` returns."""

import collections

__all__ = ['TrainResult']

TrainResult = collections.namedtuple('TrainResult', ['test_acc', 'sec_per_epoch', 'devices', 'device_params'])
TrainResult.__doc__ = 'What `train` returns: final test accuracy, seconds per epoch, slots, replicas.'
