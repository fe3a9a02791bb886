from thaw.cli import main

raise SystemExit(main())
