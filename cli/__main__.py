from edgewatt.cli.main import main

raise SystemExit(main())
