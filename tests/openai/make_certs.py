"""Test certificate authorities for the HTTPS tests (trustme), written as PEM files.

Usage: python make_certs.py DIR
Writes, for N in 1 and 2: caN.pem (a test CA) and serverN.pem / serverN.key (a certificate for
127.0.0.1 and localhost signed by CA N, with its key).
"""
import os
import sys

import trustme

out = sys.argv[1]
for n in (1, 2):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(os.path.join(out, f"ca{n}.pem"))
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    chain = os.path.join(out, f"server{n}.pem")
    for i, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(chain, append=i > 0)
    leaf.private_key_pem.write_to_path(os.path.join(out, f"server{n}.key"))
print("certificates written")
