"""`farmem doctor`: print one line per feature (farmem/doctor.py does the trying)."""

import json
import platform
import sys

from farmem import doctor
from farmem.errors import FarmemError


def cmd_doctor(args) -> int:
    if args.require:
        for name in (n.strip() for n in args.require.split(",")):
            if name not in doctor.CHECKS:
                raise FarmemError(f"no such feature {name!r}; known: {', '.join(doctor.CHECKS)}",
                                  exit_code=2)
            doctor.require(name)
        return 0
    results = doctor.run_all()
    if args.json:
        json.dump([r.as_json() for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    width = max(len(r.name) for r in results)
    print(f"farmem doctor: Linux {platform.release()} {platform.machine()}")
    for r in results:
        line = f"  {r.name:<{width}}  {'yes' if r.available else 'no ':<3}  {r.detail}"
        if not r.available:
            line += f"  -> without it: {r.without}"
        print(line)
    return 0
