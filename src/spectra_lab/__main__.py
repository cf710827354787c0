from spectra_lab.cli import main

raise SystemExit(main())
