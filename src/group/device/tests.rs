use super::*;

#[test]
fn register_get_replace_unregister() {
    let _serial = test_lock();
    register(40, Comm(0x1000), 0x2000).unwrap();
    assert_eq!(registration(40), Some(Registration { comm: Comm(0x1000), all_reduce: 0x2000 }));
    assert_eq!(last_all_reduce(), 0x2000);
    register(40, Comm(0x1100), 0x2000).unwrap();
    assert_eq!(registration(40).unwrap().comm, Comm(0x1100));
    assert!(unregister(40, Comm(0x1000)).is_err(), "only the registered communicator unregisters");
    assert_eq!(registration(40).unwrap().comm, Comm(0x1100));
    unregister(40, Comm(0x1100)).unwrap();
    assert_eq!(registration(40), None);
    assert!(unregister(40, Comm(0x1100)).is_err(), "a second unregister fails");
}

#[test]
fn bad_registrations_are_rejected() {
    let _serial = test_lock();
    assert!(register(-1, Comm(0x1000), 0x2000).is_err());
    assert!(register(41, Comm(0), 0x2000).is_err());
    assert!(register(41, Comm(0x1000), 0).is_err());
    assert_eq!(registration(41), None);
    assert_eq!(registration(-1), None);
}

#[test]
fn registrations_are_per_device() {
    let _serial = test_lock();
    register(42, Comm(0xa), 0xf).unwrap();
    register(43, Comm(0xb), 0xf).unwrap();
    assert_eq!(registration(42).unwrap().comm, Comm(0xa));
    assert_eq!(registration(43).unwrap().comm, Comm(0xb));
    unregister(42, Comm(0xa)).unwrap();
    assert_eq!(registration(43).unwrap().comm, Comm(0xb));
    unregister(43, Comm(0xb)).unwrap();
}

#[test]
fn concurrent_registration_from_many_threads() {
    let _serial = test_lock();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..200 {
                    let dev = 100 + t;
                    register(dev, Comm(0x1000 + i), 0x2000).unwrap();
                    assert_eq!(registration(dev).unwrap().comm, Comm(0x1000 + i));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    for t in 0..8 {
        unregister(100 + t, Comm(0x1000 + 199)).unwrap();
    }
}
