"""`python -m kuberay_scaler` is the same as the `kuberay-scaler` command."""

from kuberay_scaler.cli.main import main

raise SystemExit(main())
