from octopipe_core.cli import main

raise SystemExit(main())
