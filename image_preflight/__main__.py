from image_preflight.cli import main

raise SystemExit(main())
