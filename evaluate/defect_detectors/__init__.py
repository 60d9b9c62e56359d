"""Model-level defect detectors (trojan and backdoor detectors) and the controls beside them:
their plug-ins (``detectors/``), what they are given (``evidence``), the stage that runs and
stores them (``stage``), and how they are scored beside the explanation methods (``scores``)."""
