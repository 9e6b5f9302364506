module arp-guard.test/apipeer

go 1.19
