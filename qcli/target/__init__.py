"""Target profiles: the deployment target's kernel costs, and the latency they predict
(DESIGN.md §5 `target/`): qcli.target.profile holds and finds them, qcli.target.executed reads
the graph onnxruntime runs, qcli.target.predict prices it, qcli.target.measure writes one."""

from qcli.target.predict import Prediction, predict, priced
from qcli.target.profile import Profile, load_profile, resolve, shipped

__all__ = ["Prediction", "Profile", "load_profile", "predict", "priced", "resolve", "shipped"]
