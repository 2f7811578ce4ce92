from radixtop.cli import main

raise SystemExit(main())
