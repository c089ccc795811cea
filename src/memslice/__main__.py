from memslice.cli import main

raise SystemExit(main())
