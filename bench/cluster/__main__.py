from .trials import main

raise SystemExit(main())
