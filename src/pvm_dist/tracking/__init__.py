"""MLflow tracking that never stalls or breaks training, and the comparison of tracked runs.

The tracking API is re-exported here (``from pvm_dist.tracking import Tracker``); it also stays importable
from :mod:`pvm_dist.tracking.tracker`. ``pvm-dist compare`` lives in :mod:`pvm_dist.tracking.compare`.
"""

from pvm_dist.tracking.tracker import (FALLBACK_FILE, STATUSES, Tracker, TrackingWarning, configure_http_timeouts,
                                       default_tracking_uri, flatten_params, pending_metrics, read_fallback,
                                       run_tags)

__all__ = ["FALLBACK_FILE", "STATUSES", "Tracker", "TrackingWarning", "configure_http_timeouts",
           "default_tracking_uri", "flatten_params", "pending_metrics", "read_fallback", "run_tags"]
